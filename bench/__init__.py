"""carpool's benchmarks and experiments, one module each, run from the repository root with the
carpool package on PYTHONPATH (the source tree's client/python, a bundle's python/ or an
installed wheel), e.g.

    PYTHONPATH=client/python python3 -m bench.gpu --smoke
    PYTHONPATH=client/python ~/.cache/carpool/bench-venv/bin/python -m bench.peers --quick

bench.common holds what they share; docs/benchmarks.md and docs/peers.md give the methods."""
