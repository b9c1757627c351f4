# shellcheck shell=sh
# The user id this script runs as: what a run-as target checks before its first
# script (runas.RunAsTransport).
id -u
