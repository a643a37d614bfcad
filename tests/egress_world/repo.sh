#!/bin/sh
# A bare git repository at $1/repo.git with one commit (hello.txt), ready
# for a dumb-HTTP clone (update-server-info), served by servers.py.
set -eu
cd "$1"
export GIT_CONFIG_NOSYSTEM=1 HOME="$1"
git init -q --bare -b main repo.git
git init -q -b main work
printf 'hello from git.test\n' >work/hello.txt
git -C work add hello.txt
git -C work -c user.name=test -c user.email=test@example.test commit -q -m one
git -C work push -q ../repo.git main
git -C repo.git update-server-info
chmod -R a+rX repo.git
