"""`python -m bench.peers`: see bench/peers/cli.py."""

from bench.peers.cli import main

if __name__ == "__main__":
    main()


