# Sourced by the scripts: offline model loading, no telemetry anywhere.
export HF_HUB_OFFLINE=1
export TRANSFORMERS_NO_ADVISORY_WARNINGS=1
export DO_NOT_TRACK=1
export MLFLOW_DISABLE_TELEMETRY=true
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export DVC_NO_ANALYTICS=1
export TOKENIZERS_PARALLELISM=false
