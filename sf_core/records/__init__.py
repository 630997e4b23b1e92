"""An experiment's records: its folder and config.json, checkpoints, and W&B logging."""
