# Sourced by the tests that run tests/mpi/pmix_maps.c at scale (tests/launcher/pmix-scale.sh
# under greedyrun, tests/slurm/pmix-scale.sh under srun).
# pmix_maps_verdict OUT SIZE HOSTS: prints the first thing wrong with the client's output in
# OUT (a line that is not "maps RANK SIZE HOSTS ok", a rank reported other than once), or
# nothing if every rank 0..SIZE-1 reported once.
pmix_maps_verdict() {
  awk -v size="$2" -v n="$3" '
    $1 == "maps" && $3 == size && $4 == n && $5 == "ok" { seen[$2]++; next }
    { print "unexpected: " $0; exit }
    END { for (r = 0; r < size; r++) if (seen[r] != 1) { print "rank " r " reported " seen[r] + 0 " times"; exit } }' "$1"
}
