"""Learning: the batcher, the learner (SGD on the algorithm's graph), and the learner group."""
