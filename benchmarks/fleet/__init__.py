"""The fleet room: `moescope fleet` replicas and routing policies on a local Ray."""
