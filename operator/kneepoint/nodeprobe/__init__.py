"""Node probe: read a GPU node's NVML topology and label the node with its NVLink domains.

Pure modules (standard library only): ``topology`` (recording -> pair matrix, NVLink domains),
``node_labels`` (topology -> labels and annotation), ``daemonset`` (manifest builder).
Adapters: ``nvml_reader`` (the only module that imports ``pynvml``), ``node_writer``
(the only one that imports ``kubernetes``), ``command`` (click).
Importing this package imports none of the adapters' dependencies.
"""
