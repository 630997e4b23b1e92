"""Evaluation: a trained policy outside training, head-to-head games, and the evaluator
(`python -m sf_core.evaluate`)."""
