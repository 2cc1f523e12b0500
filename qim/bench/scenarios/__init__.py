"""The benchmark scenarios; each returns a :class:`~qim.bench.report.Result`."""
