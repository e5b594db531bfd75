"""Multi-stage pipelines run as one command (`lit-agents quickstart`, `lit-agents multi2`): each
stage is a LightningCLI fit of a config in ``configs/``, with held-out evaluations in between."""
