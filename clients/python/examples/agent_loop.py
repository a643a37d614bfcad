"""An agent loop: write a program, run it, read what it wrote, decide.

    EXEC_GATEWAY_TARGET=grpc://127.0.0.1:8766 EXEC_GATEWAY_TOKEN=... python agent_loop.py

A stand-in for a model proposes Python programs; each is written into the
tenant, run with a timeout, and its result file read back. A failed step
is shown its error and tries again, as an agent would. The blocking API
(`exec_gateway.sync`) keeps the loop plain.
"""

import json
import os
import sys

from exec_gateway import CommandTimeout
from exec_gateway.sync import connect


def propose(step: int, feedback: str) -> str:
    """The 'model': a first attempt with a bug, then a fix once it sees the
    error, then a last step that uses the earlier result."""
    if step == 0:
        return "import json\nprimes = [n for n in range(2, 50) if all(n % d for d in range(2, n))]\n" \
               "json.dump({'primes': primez}, open('result.json', 'w'))\n"
    if step == 1:
        assert "NameError" in feedback, feedback
        return "import json\nprimes = [n for n in range(2, 50) if all(n % d for d in range(2, n))]\n" \
               "json.dump({'primes': primes}, open('result.json', 'w'))\n"
    return "import json\nprimes = json.load(open('result.json'))['primes']\n" \
           "json.dump({'sum': sum(primes), 'count': len(primes)}, open('result.json', 'w'))\n"


def main() -> int:
    with connect(os.environ["EXEC_GATEWAY_TARGET"], token=os.environ.get("EXEC_GATEWAY_TOKEN"),
                 ca=os.environ.get("EXEC_GATEWAY_CA")) as client:
        with client.session() as session:
            root = session.environment_info().cwd
            feedback, result = "", None
            for step in range(3):
                session.files.write(f"{root}/step.py", propose(step, feedback))
                try:
                    run = session.run(["python3", "step.py"], timeout=30)
                except CommandTimeout as e:
                    feedback = f"timed out; it printed {e.stdout!r}"
                    continue
                if run.exit_code != 0:
                    feedback = run.stderr.decode(errors="replace")
                    print(f"step {step}: failed: {feedback.strip().splitlines()[-1]}")
                    continue
                result = json.loads(session.files.read_text(f"{root}/result.json"))
                print(f"step {step}: {json.dumps(result)}")
                feedback = ""
            return 0 if result == {"sum": 328, "count": 15} else 1


if __name__ == "__main__":
    sys.exit(main())
