"""Where models come from: the shipped real model, tiny random models, truncated drafts."""
