"""The multi-stage draft cascade: stages in order, a plan per step, the predictor's scores."""
