"""The project's benchmark instruments, run from a checkout (``python -m benchmarks.NAME``): :mod:`.heads` (each
head's training cost on the CPU or a GPU, with the rooflines, the whole-model step and the GPU targets) and
:mod:`.against_rev` (the CPU timings of the output layer against an earlier revision, paired in one process). They
import the library; nothing in the library imports them. The library's own benchmark is ``softmax-heads bench``."""
