"""Contract: logging starts unconfigured; logging.basicConfig(level=INFO) + logging.info prints on stderr."""
import logging
import os
import sys

RANK = int(os.environ["RANK"])
root = logging.getLogger()
sys.stdout.write(f"FACT rank={RANK} root.level={logging.getLevelName(root.level)}\n")
sys.stdout.write(f"FACT rank={RANK} root.handlers={len(root.handlers)}\n")
sys.stdout.write(f"FACT rank={RANK} disable={logging.root.manager.disable}\n")
sys.stdout.flush()
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
logging.info("training starts rank=%d", RANK)
logging.getLogger("train").info("step 1 rank=%d", RANK)
