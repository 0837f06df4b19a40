"""Contract: sys.exit(main()) where main() returns None (the usual CLI ending) ends the job with 0."""
import os
import sys

RANK = int(os.environ["RANK"])


def main():
    sys.stdout.write(f"FACT rank={RANK} ending=sys.exit(main())\n")


if __name__ == "__main__":
    sys.exit(main())
