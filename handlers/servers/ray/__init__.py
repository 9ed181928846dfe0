"""Ray's room: the same archive on Ray Serve (replicas across nodes) and Ray Data (bulk jobs)."""
