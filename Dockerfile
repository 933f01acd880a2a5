# The engram image for docker-compose.yml: the migration step, the stream workers and
# the dashboard.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY store ./store
COPY worker ./worker
COPY web ./web
COPY engram ./engram
RUN pip install --no-cache-dir .
USER nobody
CMD ["engram", "worker"]
