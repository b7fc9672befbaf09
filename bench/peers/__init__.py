"""Issue 13's CPU benchmark: carpool against the loaders users would pick instead, on the same
data. `python -m bench.peers --help` (bench/peers/cli.py) gives the method and the options.
Modules:
  scenarios  the configurations, the scenarios and their jobs
  sources    what a job of each configuration iterates
  runner     a job's and a producer's process, and the orchestrator of one configuration's run
  shards     webdataset's tar shards and its order model
  run        one run: data, catalog, each scenario's configurations (class Bench)
  report     the Markdown tables of a run's report
  cli        the command line"""


