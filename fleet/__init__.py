"""moescope fleet: engine replicas on Ray Serve behind one ingress (`moescope fleet`).

Importing this package imports no Ray: the command line reads the policies' names from it.
"""

# the fleet's routing policies (fleet/routing.py), the first the default
POLICIES = ("least_work", "round_robin", "power_of_two")
