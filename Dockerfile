# The engram image for docker-compose.yml: the migration step and the stream workers.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY store ./store
COPY worker ./worker
COPY engram ./engram
RUN pip install --no-cache-dir .
USER nobody
CMD ["engram", "worker"]
