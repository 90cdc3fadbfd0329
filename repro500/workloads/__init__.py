"""What the runner runs (docs/workloads.md).

* ``workload``  the :class:`Workload` interface every kind implements
* ``kinds``     the one ``make()`` that picks the kind a recipe describes
* ``plugins``   the one door for a recipe's model, data set and evaluator (registered or module:callable)
* ``parts``     a trained workload's data set and evaluator, found through that door
* ``trainer/``  repro500's trainer: the trained workload, the loop, a repeat, its records
* ``command/``  any program as a workload: its recipe, one repeat, its process, what it read
* ``engines/``  local, DDP and Horovod: launch, workers, collectives, rank maps
* ``models/``   the built-in models, registered as plug-ins are
"""
