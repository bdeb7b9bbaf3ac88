"""Hypothesis strategies for MSCCL program parts: any field value, sane or not (fuzzing the analyses)."""

from hypothesis import strategies as st

from backends.msccl.ir import Step, Threadblock

STEP_TYPES = ["s", "r", "rcs", "rrs", "rrc", "rrcs", "cpy", "re", "nop", "bad"]
STEP_STRATEGY = st.builds(Step, s=st.just(0), type=st.sampled_from(STEP_TYPES),
                          srcbuf=st.sampled_from("ios"), srcoff=st.integers(-2, 5), dstbuf=st.sampled_from("iosx"),
                          dstoff=st.integers(-2, 5), cnt=st.integers(-1, 3), depid=st.integers(-1, 3),
                          deps=st.integers(-2, 4), hasdep=st.integers(0, 1))
TB_STRATEGY = st.builds(Threadblock, id=st.just(0), send=st.integers(-1, 3), recv=st.integers(-1, 3),
                        chan=st.integers(0, 1), steps=st.lists(STEP_STRATEGY, max_size=5).map(tuple))
