"""The stream protocol, the Producer client and the stream Worker."""
