"""Chapter 07: model parallelism — a model split into stages on workers, pipelines, delayed gradients, tensor splits."""

from .experiment import PipelineConfig, measured_bubble, reference_training, run_pipeline
from .schedules import SCHEDULES, ideal_bubble, peak_held
from .stages import boundary_shapes, build_units, microbatch_slices, stage_bounds

__all__ = [
    "SCHEDULES",
    "PipelineConfig",
    "boundary_shapes",
    "build_units",
    "ideal_bubble",
    "measured_bubble",
    "microbatch_slices",
    "peak_held",
    "reference_training",
    "run_pipeline",
    "stage_bounds",
]
