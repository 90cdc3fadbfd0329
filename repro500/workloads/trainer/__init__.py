"""repro500's trainer: a recipe's model trained on its data set, repeat by repeat.

* ``workload``    the trained workload behind the :class:`~repro500.workloads.workload.Workload` interface
* ``spec``        what a repeat is given (the recipe's training keys, the rank, the runner's hooks)
* ``train``       the entry point a repeat (or a distributed worker) calls
* ``repeat``      one repeat's state, epoch by epoch
* ``step``        one training step (precision, micro-batches)
* ``build``       its building blocks: device, determinism, loaders, model, loss
* ``optim``       the optimizers and learning-rate schedules a recipe names
* ``evaluation``  evaluation metrics per task (sums here; mAP by torchmetrics), registered as evaluators
* ``sampling``    which samples each epoch drew (Deep500's sampling-bias metric)
* ``metrics``     measurements besides the loss: parameter digests, FLOPs, memory, Valid FLOPS
* ``records``     the repeat's files, traffic, FLOP count and MLPerf log
* ``epochs``      joules, utilization and data wait per epoch beside the trainer (``energy``: RAPL
                  and NVML meters; ``intensity``: the step's arithmetic intensity)
* ``replay``      ``repro500 locate``: a repeat replayed under an operator-hashing mode
"""
