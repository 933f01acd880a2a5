# The engram image for docker-compose.yml: the migration step, the stream workers, the
# jobs and the dashboard.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md constraints.txt ./
COPY store ./store
COPY worker ./worker
COPY web ./web
COPY jobs ./jobs
COPY engram ./engram
# With the second embedding model: the jobs may move the store to it, and the
# workers then embed with it. The versions are the lock's (constraints.txt).
RUN pip install --no-cache-dir -c constraints.txt '.[minilm]'
USER nobody
CMD ["engram", "worker"]
