"""`python -m engine.ep_worker RANK`: an expert-parallel rank that rank 0 started.

Reads (EngineConfig, port, torch threads) pickled on stdin, joins rank 0's group on
127.0.0.1:port and follows its commands until told to stop.
"""

import pickle
import sys

from engine.ep_ranks import rank_main


def main() -> None:
    config, port, threads = pickle.load(sys.stdin.buffer)
    rank_main(int(sys.argv[1]), config, port, threads)


if __name__ == "__main__":
    main()
