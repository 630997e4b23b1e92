"""`python -m sf_core.fleet up|down|status FLEET.yaml`: the env servers of a fleet file (entry module only; the
command is sf_core/cli/fleet.py, the file and the processes are in sf_core/service/); see docs/env_services.md."""
