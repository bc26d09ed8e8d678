"""Chapter 10: a transformer across the cluster — tensor and sequence, context (ring attention) and expert
parallelism, composed on a device mesh, each predicted before it is measured."""

EXPERIMENTS: dict = {}
