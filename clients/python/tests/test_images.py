"""Sessions on an image (`client.session(image=...)`): a busybox image
written here as an OCI layout the tenant may use."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import io
import json
import os
import pathlib
import tarfile

import pytest

import exec_gateway


def aio(test):
    """Runs an async test on a fresh event loop (no plugin needed)."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))
    return run


def busybox_layout(dir: pathlib.Path, marker: str) -> pathlib.Path:
    """An OCI image layout at `dir` tagged `v1`: one uncompressed layer with
    /bin/busybox, `cat` and `sh` linked to it, and /usr/share/marker."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        def add(name: str, kind: bytes, mode: int, data: bytes = b"", link: str = "") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.size, info.linkname = kind, mode, len(data), link
            info.mtime = 1_700_000_000
            tar.addfile(info, io.BytesIO(data) if data else None)
        add("bin", tarfile.DIRTYPE, 0o755)
        add("bin/busybox", tarfile.REGTYPE, 0o755, pathlib.Path("/bin/busybox").read_bytes())
        for tool in ("cat", "sh"):
            add(f"bin/{tool}", tarfile.SYMTYPE, 0o777, link="busybox")
        add("usr", tarfile.DIRTYPE, 0o755)
        add("usr/share", tarfile.DIRTYPE, 0o755)
        add("usr/share/marker", tarfile.REGTYPE, 0o644, marker.encode())
    layer = buf.getvalue()
    blobs = dir / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(b: bytes) -> dict:
        h = hashlib.sha256(b).hexdigest()
        (blobs / h).write_bytes(b)
        return {"digest": f"sha256:{h}", "size": len(b)}

    config = put(json.dumps({
        "architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers",
                   "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]},
    }).encode())
    manifest = put(json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **put(layer)}],
    }).encode())
    (dir / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest,
        "annotations": {"org.opencontainers.image.ref.name": "v1"}}]}))
    (dir / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    return dir


@aio
async def test_a_session_runs_on_the_image_it_asks_for(site):
    # Guards: `image=` reaches CreateSession; without it the session is on
    # the host; an image the tenant may not use is refused.
    if not os.path.exists("/bin/busybox"):
        pytest.skip("busybox-static (/bin/busybox) is not installed")
    image = f"oci:{busybox_layout(site.dir / 'layout', 'from-python')}:v1"
    gw = site.start(extra=f'[images]\nstore = "{site.dir}/store"\n',
                    template=f'images = ["{image}"]')
    async with await exec_gateway.connect(gw.target, token=gw.token()) as client:
        on_image = await client.session(image=image)
        r = await on_image.run(["/bin/cat", "/usr/share/marker"])
        assert (r.stdout, r.exit_code) == (b"from-python", 0)
        on_host = await client.session()
        r = await on_host.run(["/bin/cat", "/usr/share/marker"])
        assert r.exit_code != 0
        with pytest.raises(exec_gateway.Forbidden):
            await client.session(image=f"oci:{site.dir}/elsewhere:v1")
        with pytest.raises(ValueError):
            await client.session(on_image.id, image=image)
        await on_image.close()
        await on_host.close()
