"""wireup.py: wireup.c for mpi4py. MPI_Init (at import), rank and size against EXPECT_SIZE, an
allreduce every rank can predict, a barrier; one line per rank; exit 0 only if all passed.

The MPI library is the one MPI4PY_LIBMPI names (mpi4py's binary wheel loads it at import).
"""
import os
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
expect = int(os.environ.get("EXPECT_SIZE", size))
total = comm.allreduce(rank + 1, op=MPI.SUM)
comm.Barrier()
lib = MPI.Get_library_version().splitlines()[0].strip()
if size != expect or total != size * (size + 1) // 2:
    print(f"rank {rank} of {size}: FAIL (expected size {expect}, sum {total}; {lib})", flush=True)
    sys.exit(1)
print(f"rank {rank} of {size}: ok ({lib})", flush=True)
