"""engram's tests, by the package they test; the shared fixtures at the top."""
