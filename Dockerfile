# A GPU worker's image: Ray, the pinned torch and torchvision (cu130) and this project, so a new
# spot node runs a trial at once instead of installing several GB first (cluster.yaml's
# docker.worker_image, docs/CLUSTER.md). The pins are the Makefile's (tests/test_torch_pins.py).
# Untested: no Docker engine was at hand where this was written.
FROM rayproject/ray:2.58.1-py311-gpu
RUN pip install --no-cache-dir torch==2.14.1+cu130 torchvision==0.29.1+cu130 \
        --index-url https://download.pytorch.org/whl/cu130
COPY --chown=ray:users . /home/ray/unbiased-mi
RUN pip install --no-cache-dir -e /home/ray/unbiased-mi torch==2.14.1+cu130 torchvision==0.29.1+cu130
