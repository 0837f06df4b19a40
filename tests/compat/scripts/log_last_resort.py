"""Contract: logging.warning without any configuration prints the bare message on stderr."""
import logging
import os

RANK = int(os.environ["RANK"])
logging.warning("careful rank=%d", RANK)
logging.getLogger("data").error("missing shard rank=%d", RANK)
logging.info("not shown rank=%d", RANK)
