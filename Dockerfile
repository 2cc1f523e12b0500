# The qim image: one image, one process per container (worker apps, gateway, admin).
FROM python:3.11-slim-bookworm
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY qim ./qim
RUN pip install --no-cache-dir -c constraints.txt . \
    && useradd --create-home --uid 10001 qim
USER qim
ENV QIM_KAFKA_BOOTSTRAP=kafka:9092 QIM_REDIS_URL=redis://redis:6379/0
ENTRYPOINT ["qim"]
