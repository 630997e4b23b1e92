"""Running an experiment: the runner, its stats and progress line, populations, PBT and presets."""
