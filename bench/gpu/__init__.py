"""Issue 9's GPU benchmark: carpool's GPU path end to end against torchvision's DataLoader (and
issue 13's GPU peers) in the same run. `python -m bench.gpu --help` (bench/gpu/cli.py) gives the
method and the options. Modules:
  scenarios  the scenarios and their jobs' batch sizes
  sides      what a job of each side iterates (carpool, DataLoader, GPU decode, TensorSocket)
  jobs       a job's process (its training loop and timings) and the orchestrator of a scenario
  run        one run: the data, the machine's limits, each scenario's sides (class Bench)
  report     the Markdown tables of a run's report
  cli        the command line"""


