"""The travel example's tools, plain typed functions served through the manifest's `functions:` list.

They answer from `world.py` (fictional cities, no network) and return short text, as a real travel API
wrapper would. Bad arguments raise `ValueError`; the tool env turns that into an error message the
model sees, listing the valid values.
"""
from __future__ import annotations

from examples.travel.world import CATEGORIES, CITIES, MODES, find_poi, travel


def _city(city: str) -> str:
    match = next((c for c in CITIES if c.lower() == city.strip().lower()), None)
    if match is None:
        raise ValueError(f"unknown city {city!r}; cities: {', '.join(CITIES)}")
    return match


def search_poi(city: str, category: str) -> str:
    """List the points of interest of one category in a city, best rated first.

    Args:
        city: city name, e.g. "Lindmoor".
        category: one of museum, park, restaurant, landmark, market.
    """
    name = _city(city)
    if category not in CATEGORIES:
        raise ValueError(f"unknown category {category!r}; categories: {', '.join(CATEGORIES)}")
    found = sorted((p for p in CITIES[name] if p.category == category), key=lambda p: -p.rating)
    return "\n".join(f"{p.name} | rating {p.rating} | open {p.hours} | price {p.price}" for p in found)


def route(city: str, origin: str, destination: str, mode: str = "walk") -> str:
    """Distance and travel time between two points of interest of a city.

    Args:
        city: city name.
        origin: exact name of the starting point of interest.
        destination: exact name of the destination point of interest.
        mode: walk, bus, metro or taxi.
    """
    name = _city(city)
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")
    ends = [find_poi(name, origin), find_poi(name, destination)]
    for label, poi in zip((origin, destination), ends):
        if poi is None:
            raise ValueError(f"no point of interest {label!r} in {name}; use search_poi to find names")
    km, minutes = travel(ends[0], ends[1], mode)
    return f"{ends[0].name} -> {ends[1].name} by {mode}: {km} km, about {minutes} min"
