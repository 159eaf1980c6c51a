"""The travel example's world: three fictional cities with points of interest on a km grid.

Fictional on purpose: the data ships with the repository, needs no API key or network, and a model
cannot answer from memory, so a good itinerary has to come from the tools. `tools.py` serves it,
`prepare_data.py` writes requests and reference itineraries from it, `reward.py` checks answers
against it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Poi:
    name: str
    category: str
    x_km: float
    y_km: float
    rating: float
    hours: str
    price: int  # entry or average meal price, in the local currency


CITIES: dict[str, list[Poi]] = {
    "Lindmoor": [
        Poi("Lindmoor Museum of Clocks", "museum", 1.0, 2.0, 4.6, "09:00-17:00", 12),
        Poi("Harbour Art House", "museum", 4.5, 0.5, 4.1, "10:00-18:00", 9),
        Poi("Willow Park", "park", 2.0, 3.5, 4.4, "06:00-22:00", 0),
        Poi("Old Quarry Gardens", "park", 6.0, 4.0, 4.7, "08:00-20:00", 3),
        Poi("The Salt Table", "restaurant", 1.5, 1.5, 4.5, "11:30-22:00", 24),
        Poi("Lantern Noodle Bar", "restaurant", 4.0, 1.0, 4.2, "11:00-23:00", 11),
        Poi("Bellrope Tower", "landmark", 1.2, 2.4, 4.8, "09:00-19:00", 6),
        Poi("Copper Street Market", "market", 3.0, 1.0, 4.3, "07:00-14:00", 0),
    ],
    "Varesa": [
        Poi("Varesa Natural History Hall", "museum", 0.5, 0.5, 4.4, "09:30-17:30", 10),
        Poi("Glassworks Gallery", "museum", 3.0, 2.5, 4.7, "10:00-17:00", 14),
        Poi("Riverside Commons", "park", 1.5, 4.0, 4.2, "00:00-24:00", 0),
        Poi("Cedar Hill Reserve", "park", 5.5, 5.0, 4.6, "07:00-19:00", 5),
        Poi("Osteria Nove", "restaurant", 2.5, 2.0, 4.6, "12:00-22:30", 28),
        Poi("Dockside Dumplings", "restaurant", 0.8, 3.2, 4.0, "10:30-21:00", 9),
        Poi("Twin Arch Bridge", "landmark", 2.0, 3.0, 4.5, "00:00-24:00", 0),
        Poi("Lantern Night Market", "market", 3.5, 1.5, 4.4, "17:00-23:59", 0),
    ],
    "Kelport": [
        Poi("Maritime Museum of Kelport", "museum", 0.2, 1.0, 4.5, "09:00-18:00", 11),
        Poi("Kelport Toy Museum", "museum", 2.2, 2.2, 4.3, "10:00-16:00", 7),
        Poi("Gullcliff Park", "park", 0.5, 3.0, 4.5, "06:00-21:00", 0),
        Poi("Fern Valley Botanic Garden", "park", 4.0, 3.5, 4.8, "09:00-18:00", 8),
        Poi("Brine & Barley", "restaurant", 0.6, 1.4, 4.4, "11:00-22:00", 19),
        Poi("Hillside Curry House", "restaurant", 3.6, 3.0, 4.6, "11:30-21:30", 15),
        Poi("Kelport Lighthouse", "landmark", 0.0, 0.0, 4.9, "08:00-20:00", 4),
        Poi("Fishmongers' Row", "market", 1.0, 0.8, 4.1, "05:00-12:00", 0),
    ],
}
CATEGORIES = ("museum", "park", "restaurant", "landmark", "market")
# km/h and a fixed overhead in minutes (waiting, parking) per transport mode
MODES = {"walk": (4.5, 0), "bus": (18.0, 8), "metro": (30.0, 6), "taxi": (25.0, 4)}


def find_poi(city: str, name: str) -> Poi | None:
    """The POI of `city` called `name` (case-insensitive), or None."""
    return next((p for p in CITIES.get(city, []) if p.name.lower() == name.strip().lower()), None)


def travel(a: Poi, b: Poi, mode: str) -> tuple[float, int]:
    """(distance in km, minutes) from a to b by `mode`, on a Manhattan grid."""
    km = round(abs(a.x_km - b.x_km) + abs(a.y_km - b.y_km), 1)
    speed, overhead = MODES[mode]
    return km, overhead + math.ceil(60 * km / speed)
