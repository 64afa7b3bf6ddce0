"""Unit tests of calculet.daemon.core (KV lanes, admission, job buffer pool)."""
