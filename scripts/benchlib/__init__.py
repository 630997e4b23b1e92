"""The parts of scripts/benchmark.py, one concept per module.

proctree        memory sampling over a process tree; killing it and removing its /dev/shm files
window          progress reports (points) reduced to the timed window's rates
watch           running one trainer subprocess and stopping it once the window is covered
raw_env         the raw env-stepping baseline phases
ours            our trainer's phases (sampling, training, variants), read from training_summary.json
sample_factory  the Sample Factory 2.1.1 phase (run with its own interpreter, scripts/sf_launcher.py)
report          machine description, ratios, the table and the JSON file
sweep           --sweep: the training phase over a small grid of sizing flags, and the best point
scaling         --scaling: the training phase at several --num_workers, and its PNG plot

and of scripts/reproduce.py:

published       the published scores (published_scores.json), the suites, where a curve reaches a score
reproduction    one run: the trainer timed from launch to exit, its curve, evaluation and raw rate; its record
reproduction_report  per env over seeds beside the published scores: results.json and results.md
reproduction_plot    per env, every seed's curve with the published scores as lines
"""

import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
