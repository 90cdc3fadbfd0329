"""The scaling model behind ``repro500 model`` (docs/scaling.md).

An alpha-beta model of the collectives (Ben-Nun & Hoefler, "Demystifying Parallel and
Distributed Deep Learning", 2019), fitted to allreduce and allgather timed on this machine,
predicts the step time and the parallel efficiency of data-parallel training at many
process counts, for a model size and a gradient compressor:

    measure   time Gloo allreduce / allgather over message sizes (cached per host + torch)
    fit       least-squares latency L and seconds-per-byte gamma of each collective
    alphabeta the two formulas, shared by the fit and the prediction
    wire      bytes per DDP bucket on the wire, from repro500.ext's own accounting
    sizes     parameter counts of known models
    rundir    what a run directory measured: compute time, step time, bytes, buckets
    predict   step time, communication time, efficiency and bytes at each P
    document  the ``repro500/scaling/v1`` document (RUN/derived/scaling.json)
    render    the terminal table
    ceilings  the roofline record's ceilings (repro500 roofline), read for the terminal and the report

Nothing here imports repro500.workloads (imports run one way, see DESIGN.md), and torch,
numpy and scipy are imported only by the functions that need them.
"""
