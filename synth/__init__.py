"""synth: synthesize collective-communication algorithms for GPU clusters.

The pipeline (see DESIGN.md section 2) runs one way::

    Topology + Collective (+ Sketch) -> encoder -> HiGHS -> Schedule -> replay check -> backends

Everything between stages is a frozen dataclass.
"""

__version__ = "0.1.0"
