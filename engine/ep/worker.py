"""`python -m engine.ep.worker RANK`: an expert-parallel rank that rank 0 started.

Reads (EngineConfig, port, torch threads) pickled on stdin, joins rank 0's group on
127.0.0.1:port and follows its commands until told to stop. Ctrl-C in the terminal reaches
the whole process group; this rank ignores it and stops when rank 0 tells it to, or exits
when rank 0 is gone.
"""

import pickle
import signal
import sys

from engine.ep.ranks import rank_main


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    rank = int(sys.argv[1])
    config, port, threads = pickle.load(sys.stdin.buffer)
    try:
        rank_main(rank, config, port, threads)
    except RuntimeError as exc:  # a collective failed: rank 0 (or a peer) is gone
        sys.exit(f"moescope expert-parallel rank {rank}: stopping, the group broke ({exc})")


if __name__ == "__main__":
    main()
