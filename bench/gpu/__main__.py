"""`python -m bench.gpu`: see bench/gpu/cli.py."""

from bench.gpu.cli import main

if __name__ == "__main__":
    main()


