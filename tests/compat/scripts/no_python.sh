# Contract: --no-python runs a program (here sh) with the torchrun environment and its arguments.
echo "FACT rank=$RANK program=sh args=$*"
echo "FACT rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE master_port_set=${MASTER_PORT:+yes}"
