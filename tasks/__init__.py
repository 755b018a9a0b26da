"""Units of MLOps work as plain typed functions, grouped by the stage of the loop they serve.

Each subpackage may import the ones below it and ``serving`` and ``registry``; never the
ones above it, nor ``flows`` or ``specops`` (the import-linter contracts in
``pyproject.toml`` enforce this in the test command)::

    loop · bench · ops      the loop's steps and their Prefect wrappers · the measurement
                            commands (bench, profile, quality) · operating a server (load test)
    evaluate                interleaved evaluation and its timing loop, gates, per-target
                            evaluation, exports
    train                   teacher data, the trainers and their shared loop, suffix index
    data                    workloads, collection, validation, dataset, versioning
"""
