"""The boundary classes of issue 45 and, per assignment and question, the wrong solution of each class the mutation
suite grades (or why the class does not apply)."""

from __future__ import annotations

from . import edges_a, edges_b, edges_c

CLASSES = {
    "order": "ordering with several elements",
    "dtype": "integer or non-float64 inputs where code could assume floats",
    "itemsize": "byte counts from an element size",
    "limit": "answers at the limits of a search or a range",
    "edge": "other edges the question's text allows",
}

COVERAGE: dict[str, dict[str, dict[str, str]]] = {**edges_a.COVERAGE, **edges_b.COVERAGE, **edges_c.COVERAGE}
VARIANTS = {"ps01_sgd": edges_a.PS01, "ps02_hogwild": edges_a.PS02, "ps03_ps": edges_a.PS03,
            "ps04_syncasync": edges_a.PS04, "ps05_collectives": edges_b.PS05,
            "ps06_threads": edges_b.PS06,
            "ps07_model_parallel": edges_b.PS07, "ps08_averaging": edges_b.PS08, "ps09_onebit": edges_c.PS09,
            "ps10_sim": edges_c.PS10, "ps11_ring_comm": edges_c.PS11,
            "ps12_sharding": edges_c.PS12, "ps13_transformer": edges_c.PS13}
