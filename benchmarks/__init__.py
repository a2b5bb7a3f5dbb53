"""The benchmark harness behind ``python benchmark.py`` (see ``docs/benchmarks.md``).

* :mod:`.measure`: timers with device synchronisation, peak memory, summaries;
* :mod:`.tasks`: a dataset and a model turned into a neuron graph, labels and an oracle;
* :mod:`.contenders`: the engines that are timed (neurovec presets, PyG, reference, autotune);
* :mod:`.neuralogic_models`: the same models in PyNeuraLogic, and NeuraLogic's own engine;
* :mod:`.suite`: runs every engine of every task: check, then time;
* :mod:`.report`: the JSON file, the markdown tables and the plots.

The other files in this folder are stand-alone timing scripts.
"""
