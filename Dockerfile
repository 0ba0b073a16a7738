# One image for the API, workers and the TVM RPC tracker/servers.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends build-essential && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY compiler compiler
COPY tuner tuner
COPY service service
COPY migrations migrations
COPY bench bench
COPY web web
# the CPU build of torch; PyPI alone would pull several GB of CUDA
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple .
ENV ALTUNE_DATA_DIR=/data
EXPOSE 8000
CMD ["altune", "serve", "--host", "0.0.0.0", "--workers", "0"]
