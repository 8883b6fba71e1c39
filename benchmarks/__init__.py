"""Benchmarks and load tests, apart from the product. Each runs from the repository root as a module
of this package, which puts the project's flat modules on the path: `python -m benchmarks.bench`,
`python -m benchmarks.bench_translate`, `python -m benchmarks.bench_data`, `python -m benchmarks.loadtest`."""
