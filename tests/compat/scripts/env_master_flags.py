"""Contract: --master-addr/--master-port are what the workers get as MASTER_ADDR/MASTER_PORT."""
import os
import sys

RANK = int(os.environ["RANK"])
port = sys.argv[1]
sys.stdout.write(f"FACT rank={RANK} MASTER_ADDR={os.environ.get('MASTER_ADDR')}\n")
sys.stdout.write(f"FACT rank={RANK} MASTER_PORT_is_given={os.environ.get('MASTER_PORT') == port}\n")
sys.stdout.write(f"FACT rank={RANK} TORCHELASTIC_USE_AGENT_STORE={os.environ.get('TORCHELASTIC_USE_AGENT_STORE')}\n")
