# shellcheck shell=sh
# Argument: DEST. Creates DEST and unpacks the tar stream on the standard input there,
# without restoring owners.
rw_dest=$1
mkdir -p -- "$rw_dest" || exit 3
tar -xf - -o -C "$rw_dest" || exit 4
