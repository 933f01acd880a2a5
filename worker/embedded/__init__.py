"""The local embedded server: valkey, the run file, finding and reaching the servers."""
