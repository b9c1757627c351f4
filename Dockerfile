# One image for the worker, beat and Flower services of docker-compose.yml.
FROM python:3.11-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends openssh-client procps tini \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY producers ./producers
COPY store ./store
COPY workers ./workers
COPY examples ./examples
# The workers' extra (SSH) and Flower's: the image runs no web view.
RUN pip install --no-cache-dir '.[worker,flower]'
# Jobs on the local target live under /runs; SSH keys and known_hosts come in /keys.
RUN useradd --create-home --uid 1000 runwarden && mkdir -p /runs /home/runwarden/state/runs \
    && chown -R runwarden /runs /home/runwarden/state
USER runwarden
ENTRYPOINT ["tini", "-s", "--"]
