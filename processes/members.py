"""What a group of private members started and stopped together shares: the etcd cluster and the
ZooKeeper ensemble each hold a list of members with a client port and a health check."""

from __future__ import annotations


class MemberGroup:
    """Members reached by iterating, ``len()`` and ``[index]``, described, checked and stopped together."""

    #: What the group is called in its description, e.g. "etcd cluster".
    label = "group"
    members: list

    def __iter__(self):
        return iter(self.members)

    def __len__(self) -> int:
        return len(self.members)

    def __getitem__(self, index: int):
        return self.members[index]

    @property
    def description(self) -> str:
        ports = ", ".join(str(member.client_port) for member in self.members)
        return f"{self.label} of {len(self.members)} members on 127.0.0.1 ports {ports}"

    def running(self) -> bool:
        """Every member runs and is healthy (its own check: an etcd leader, a ZooKeeper that serves)."""
        return all(member.healthy() for member in self.members)

    def stop(self) -> None:
        for member in self.members:
            member.stop()
